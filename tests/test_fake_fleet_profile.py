"""bench/fake_fleet.py's py-spy summary: shares of collapsed stacks, waits counted apart."""

from __future__ import annotations

from pathlib import Path

from bench.fake_fleet import profile_summary

SERVE = "serve (flwr/server/superlink/fleet/grpc_rere/fleet_servicer.py"
RAW = (f"main (a.py:1);{SERVE}:5);verify_signature (asymmetric.py:9) 6\n"
       f"main (a.py:1);{SERVE}:7);get (flwr/server/superlink/linkstate/sql_linkstate.py:2) 3\n"
       "main (a.py:2) 1\n"
       "main (a.py:1);Condition.wait (threading.py:3) 90\n")


def sections(text: str) -> dict[str, list[list[str]]]:
    out: dict[str, list[list[str]]] = {}
    for line in text.splitlines()[1:]:
        if line.strip().startswith("by "):
            key = line.strip()[3:-1]
            out[key] = []
        else:
            out[key].append(line.split())
    return out


def test_shares_by_hand(tmp_path: Path) -> None:
    raw = tmp_path / "superlink.txt"
    raw.write_text(RAW)
    text = profile_summary(raw, top=3)
    assert "100 samples at 50/s, 10 active, 90 waiting" in text  # the wait is set apart
    got = sections(text)
    # the leaf's part first: 6 node auth, 3 link state (under a gRPC frame), 1 other
    assert [r[0] for r in got["part"]] == ["60.0%", "30.0%", "10.0%"]
    assert [" ".join(r[1:3]) for r in got["part"]] == ["node auth:", "link state", "other"]
    # own samples by leaf, line numbers dropped; inclusive: main on all 10, serve on 9
    assert [r[:2] for r in got["own"]] == [["60.0%", "verify_signature"], ["30.0%", "get"],
                                           ["10.0%", "main"]]
    assert [r[:2] for r in got["inclusive"][:2]] == [["100.0%", "main"], ["90.0%", "serve"]]


def test_no_samples_says_so(tmp_path: Path) -> None:
    assert "no active samples" in profile_summary(tmp_path / "missing.txt", top=3)
