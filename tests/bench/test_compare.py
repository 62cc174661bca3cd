"""`handbook bench compare` names a crossover: where one ladder stops winning against the other (the reference's
drafting result, "wins up to 32 streams, loses from 64"), or that it wins or loses everywhere it was measured."""

from __future__ import annotations

import orjson

from orchestrator import cli
from orchestrator.bench.compare import Crossover, crossovers, verdict_line

PLAIN = [(1, 73.1), (4, 279.0), (8, 523.2), (16, 960.9), (32, 1584.0), (64, 2288.4), (128, 2899.0)]
DRAFTING = [(1, 160.1), (4, 586.3), (8, 989.5), (16, 1472.8), (32, 1914.5), (64, 2076.9), (128, 2063.0)]


def ladder(rows, label=None) -> dict:
    return {"label": label, "levels": [{"streams": n, "sustained_tok_s": v} for n, v in rows], "fit": None}


def test_the_reference_drafting_ladder_crosses_over_between_32_and_64_streams(tmp_path, capsys):
    a, b = ladder(PLAIN, "plain"), ladder(DRAFTING, "drafting")
    assert crossovers(a, b) == [Crossover(32, 64, "wins", "loses")]
    assert verdict_line(a, b, "drafting") == "crossover: drafting wins up to 32 streams, loses from 64"
    pa, pb = tmp_path / "plain.json", tmp_path / "drafting.json"
    pa.write_bytes(orjson.dumps(a))
    pb.write_bytes(orjson.dumps(b))
    assert cli.main(["bench", "compare", str(pa), str(pb)]) == 0
    assert "crossover: drafting wins up to 32 streams, loses from 64" in capsys.readouterr().out
    # the other way round, the verdict turns over with it
    assert verdict_line(b, a, "plain") == "crossover: plain loses up to 32 streams, wins from 64"


def test_no_crossover_and_even_levels_are_said_as_such():
    a = ladder([(1, 100.0), (8, 700.0), (64, 2000.0)])
    faster = ladder([(1, 120.0), (8, 800.0), (64, 2100.0)])
    assert crossovers(a, faster) == []
    assert verdict_line(a, faster, "B") == "B wins at every stream count measured (1-64)"
    # within 1% is even: a ladder that wins, ties, then loses crosses over twice
    mixed = ladder([(1, 150.0), (8, 703.0), (64, 1500.0)])
    assert crossovers(a, mixed) == [Crossover(1, 8, "wins", "is even"), Crossover(8, 64, "is even", "loses")]
    assert verdict_line(a, mixed, "B") == "crossover: B wins up to 1 stream, is even from 8, loses from 64"
    # stream counts only one ladder measured are left out
    assert verdict_line(a, ladder([(2, 10.0)]), "B") is None
