"""bench.generated: a generated part of BENCHMARKS.md is checked, then rewritten."""

from bench.generated import Generated


def test_a_stale_part_fails_the_check_and_is_rewritten_once(tmp_path, capsys):
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("intro\n<!-- a -->old<!-- b -->\nrest\n")

    def bounds(text):
        start = text.index("<!-- a -->") + len("<!-- a -->")
        return start, text.index("<!-- b -->")

    def current(text):
        start, end = bounds(text)
        return text[start:end]

    def replace(text, new):
        start, end = bounds(text)
        return text[:start] + new + text[end:]

    part = Generated("test part", "bench.test", lambda: "new", current, replace)
    assert part.main(["--check"], "d", doc) == 1
    assert "out of date: run python -m bench.test" in capsys.readouterr().out
    assert part.main([], "d", doc) == 0 and doc.read_text() == "intro\n<!-- a -->new<!-- b -->\nrest\n"
    assert part.write(doc) is False
    assert part.main(["--check"], "d", doc) == 0
