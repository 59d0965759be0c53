# Source this on the lent GPU machine (device tool): installs the carried wheels (.whl/) that
# its image lacks (papermill, ipykernel, nbclient, myst-nb for glue, ...) into /tmp/site and
# puts them and the repository on PYTHONPATH. Not used anywhere else.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export PATH=/tmp/site/bin:$PATH
export PYTHONUNBUFFERED=1 HALLUC_BATCH=1
unset MPLBACKEND  # kernels must use the inline backend, or plt.show() draws nothing
