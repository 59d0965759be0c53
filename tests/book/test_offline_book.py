"""The book's Sphinx extension, on small inputs (no build): what it takes out of the code cells
and what it shows as code in recorded claim tables."""

import importlib.util

import pytest

from tests.book.conftest import ROOT

pytestmark = pytest.mark.book
_spec = importlib.util.spec_from_file_location("offline_book",
                                               ROOT / "book" / "_ext" / "offline_book.py")
offline_book = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(offline_book)


def test_nbval_markers_leave_the_shown_code_and_nothing_else_does():
    source = ("# NBVAL_CHECK_OUTPUT\nt = ClaimTable('x')\n"
              "# a comment about NBVAL_CHECK_OUTPUT stays\nt")
    assert offline_book.without_nbval_markers(source) == (
        "t = ClaimTable('x')\n# a comment about NBVAL_CHECK_OUTPUT stays\nt")
    assert offline_book.without_nbval_markers("x = 1\n# NBVAL_IGNORE_OUTPUT\ny") == "x = 1\ny"


def test_backticks_in_a_recorded_claim_table_become_code_but_not_elsewhere():
    table = ('<table class="claim-table"><tr><td>`tgt +=` adds</td>'
             '<td>after `:` for 1 7 + 2 5 =</td><td>2 &gt; 4</td></tr></table>')
    shown = offline_book.claim_table_code(table)
    assert "<code>tgt +=</code> adds" in shown and "after <code>:</code> for" in shown
    assert "`" not in shown
    other = "<table><tr><td>`kept`</td></tr></table>"
    assert offline_book.claim_table_code(other) == other


def test_the_library_drawing_code_becomes_a_function_of_the_explorer_id():
    script = offline_book.explorer_drawing_script(offline_book.INTERACTIVE_JS.read_text())
    assert script.count("window.hlDrawExplorer = function (rootId)") == 1
    assert '"__ROOT_ID__"' not in script and "document.getElementById(rootId)" in script
    with pytest.raises(ValueError, match="__ROOT_ID__"):
        offline_book.explorer_drawing_script("(function () { var root = document.body; })();")


def test_a_pages_text_is_its_article_without_scripts_and_styles():
    page = ('<html><head><title>t</title></head><body><nav>menu</nav>'
            '<main role="main"><div class="header">.ipynb .pdf</div>'
            '<article class="bd-article"><h1>Bradley–Terry</h1><p>a <b>pair</b><br>of answers</p>'
            '<script>var x = 1;</script><style>p {}</style><img src="a.png"><p>ranked</p></article>'
            '</main><footer>foot</footer></body></html>')
    assert offline_book.page_text(page) == "Bradley–Terry a pair of answers ranked"


def test_search_text_script_answers_for_pages_escaped_and_only_over_file_urls():
    script = offline_book.search_text_script({"notebooks/09_preference": "Bradley <b> & Terry"})
    assert "location.protocol !== 'file:'" in script
    page = '<div role=\\"main\\">Bradley &lt;b&gt; &amp; Terry</div>'
    assert f'"notebooks/09_preference.html": "{page}"' in script
