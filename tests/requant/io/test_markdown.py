"""requant.io.markdown.table. Reference: GitHub-flavoured Markdown's table syntax (a header row,
a delimiter row of `---` / `---:` cells, one row per line), written out literally."""

from requant.io.markdown import table


def test_table_lines_and_alignment():
    got = table(["a", "b", "c"], [[1, "x", ""], ["2|", 3.5, None]], align="lr")
    assert got == [
        "| a | b | c |",
        "| --- | ---: | --- |",
        "| 1 | x |  |",
        "| 2| | 3.5 | None |",
    ]


def test_no_rows_and_default_alignment():
    assert table(["only"], []) == ["| only |", "| --- |"]
