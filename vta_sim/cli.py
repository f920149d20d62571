"""``vtakit sim IMAGE``: run a saved run image and print its statistics."""

from __future__ import annotations

import click

from .errors import SimError
from .image import RunImage

__all__ = ["sim_command"]


@click.command("sim")
@click.argument("image", type=click.Path(exists=True, dir_okay=False))
@click.option("--no-timing", is_flag=True, help="Functional run only (no cycle count).")
@click.option("--trace", type=click.Path(dir_okay=False), default=None,
              help="Write a Perfetto / Chrome-trace JSON timeline here.")
@click.option("--cycle-limit", type=int, default=None, help="Fail after this many cycles.")
def sim_command(image: str, no_timing: bool, trace: str | None,
                cycle_limit: int | None) -> None:
    """Run the instruction stream saved in IMAGE (a RunImage .npz) on the simulator."""
    img = RunImage.load(image)
    if img.description:
        click.echo(img.description)
    try:
        stats, _ = img.run(timing=not no_timing, cycle_limit=cycle_limit, trace=trace)
    except SimError as err:
        raise click.ClickException(str(err)) from None
    click.echo(stats.summary())
