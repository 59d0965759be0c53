# Source this on a GPU machine whose Python lacks the notebook tools: installs the wheels in .whl/
# that it lacks (papermill, ipykernel, nbclient, myst-nb for glue, ipywidgets so that importing
# tqdm.auto prints no warning into a notebook, ...) into /tmp/site and
# puts them and the repository on PYTHONPATH. Not used anywhere else.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export PATH=/tmp/site/bin:$PATH
export PYTHONUNBUFFERED=1 HALLUC_BATCH=1
unset MPLBACKEND  # kernels must use the inline backend, or plt.show() draws nothing
