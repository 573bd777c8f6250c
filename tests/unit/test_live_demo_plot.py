"""demo-live.png, read from its matplotlib figure: a y label, and the batch ceiling, in the README's
terms, that explains a queue while the running set is at the cap."""

from __future__ import annotations

from pathlib import Path

from wok.live_demo import PARAMS, Tick, live_figure

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_the_live_plot_has_a_y_label_and_shows_the_batch_ceiling():
    # A burst: the batch climbs to the ceiling and requests wait in the queue there.
    ticks = [
        Tick(
            t=float(i),
            waiting=max(0.0, 30.0 - i),
            running=min(24.0, 2.0 * i),
            batch=min(24, 2 + 2 * i),
            reason="",
        )
        for i in range(30)
    ]
    fig = live_figure(ticks)
    [ax] = fig.axes
    assert ax.get_ylabel() == "requests (one pod)"
    ceiling = min(PARAMS.batch_max, PARAMS.batch_mem)
    lines = {line.get_label(): line for line in ax.get_lines()}
    [label] = [name for name in lines if name.startswith("batch ceiling")]
    assert f"ceiling {ceiling} " in label
    assert set(lines[label].get_ydata()) == {ceiling}
    legend = [text.get_text() for text in ax.get_legend().get_texts()]
    assert label in legend
    # Each term of the legend is one the README's law uses; it speaks of no queue target.
    assert "min(B_max, B_mem)" in label and "min(B_max, B_mem)" in README
    assert not [text for text in legend if "target" in text or "deadband" in text]


def test_the_live_law_gets_its_throughput_inputs_from_two_scrapes():
    """The law holds both knobs without completions and rejections: the demo gives it their
    rates from consecutive scrapes (none before the second, as Prometheus' rate())."""
    from wok.live_demo import per_s

    first = (1.0, {"vllm:request_success_total": 10.0})
    second = (3.0, {"vllm:request_success_total": 30.0})
    assert per_s("vllm:request_success_total", None, first) is None
    assert per_s("vllm:request_success_total", first, second) == 10.0
    assert per_s("wok_rejected_requests_total", first, second) is None
