"""Progress a person reads: a tqdm bar on a terminal with log lines printed above it; plain
lines with count, rate and ETA elsewhere (no carriage returns)."""

from __future__ import annotations

import io
import logging

from ckptflow.core.progress import Progress, human_size, human_time


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_every_n_steps_with_rate_and_eta(caplog):
    out = io.StringIO()
    p = Progress(100, every_n=50, stream=out, logger=logging.getLogger("t"))
    with caplog.at_level(logging.INFO, logger="t"), p:
        for i in range(1, 101):
            p.update_to(i, f"train_loss {1 / i:.3g}")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and lines[0].startswith("step 50/100 train_loss 0.02 | ")
    assert "step/s, ETA " in lines[0] and lines[1].endswith(", done")
    assert out.getvalue() == "" and "\r" not in "".join(lines)


def test_bytes_by_time_are_quiet_when_quick_and_printed_to_the_stream():
    out = io.StringIO()
    with Progress(0, desc="verify", nbytes=True, stream=out, every_s=3600) as p:
        p.add(512, total=2048)
        p.add(1536, total=2048)
    assert out.getvalue() == ""  # a quick operation stays quiet
    out = io.StringIO()
    with Progress(2048, desc="verify", nbytes=True, stream=out, every_s=0.0) as p:
        p.add(1024)
    assert out.getvalue().startswith("verify 1.0 KiB / 2.0 KiB | ") and "/s, ETA" in out.getvalue()


def test_a_terminal_gets_a_bar_and_log_lines_above_it_never_glued(monkeypatch):
    tty = Tty()
    monkeypatch.setattr("sys.stderr", tty)
    logger = logging.getLogger("t.bar")
    handler = logging.StreamHandler()  # a step's logging: plain lines on stderr
    logging.getLogger().addHandler(handler)
    try:
        with Progress(10) as p:
            p.update_to(3, "train_loss 1.5")
            logger.warning("checkpoint 3 committed")
            p.update_to(10)
    finally:
        logging.getLogger().removeHandler(handler)
    text = tty.getvalue()
    assert "10/10" in text and "train_loss 1.5" in text
    # the log line has a line of its own: tqdm cleared the bar before writing it
    lines = [ln.split("\r")[-1] for ln in text.split("\n")]
    assert "checkpoint 3 committed" in lines, text


def test_human_units():
    assert (human_size(1536), human_size(100), human_size(3 * 2**30)) == (
        "1.5 KiB",
        "100 B",
        "3.0 GiB",
    )
    assert (human_time(75), human_time(3700)) == ("1:15", "1:01:40")
