"""``vtakit sim IMAGE``: run a saved run image and print its statistics."""

from __future__ import annotations

import click

from .errors import DEFAULT_CYCLE_LIMIT, SimError
from .image import RunImage

__all__ = ["sim_command"]


@click.command("sim")
@click.argument("image", type=click.Path(exists=True, dir_okay=False))
@click.option("--no-timing", is_flag=True, help="Functional run only (no cycle count).")
@click.option("--trace", type=click.Path(dir_okay=False), default=None,
              help="Write a Perfetto / Chrome-trace JSON timeline here.")
@click.option("--cycle-limit", type=click.IntRange(min=0), default=DEFAULT_CYCLE_LIMIT,
              show_default=True,
              help="Fail after this many cycles (0: no limit). The default is far above any "
                   "legitimate run (a ResNet-18 region takes about 10^7 cycles). With "
                   "--no-timing, an instruction with which one unit's instructions would take "
                   "longer (by their closed-form cycles) is refused before it runs.")
def sim_command(image: str, no_timing: bool, trace: str | None, cycle_limit: int) -> None:
    """Run the instruction stream saved in IMAGE (a RunImage .npz) on the simulator."""
    img = RunImage.load(image)
    if img.description:
        click.echo(img.description)
    try:
        stats, _ = img.run(timing=not no_timing, cycle_limit=cycle_limit or None, trace=trace)
    except SimError as err:
        raise click.ClickException(str(err)) from None
    click.echo(stats.summary())
