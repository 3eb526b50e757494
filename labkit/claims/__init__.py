"""The seeds' promises about mixed precision, as data, and a verdict computed from measurements.

Each `Claim` (`labkit.claims.catalog`) quotes a seed (in Chinese, with an English translation),
says what has to be measured to check it, and which 16-bit precisions it is about. `verdict`
(`labkit.claims.verdicts`) compares one measured 16-bit record with its fp32 baseline -- the same
framework, model and shape -- and returns the measured value and a verdict text; `verdict_table`
and `summary_table` (`labkit.claims.tables`) do it for every comparison in a list of records (from
`labkit.bench.bench`, or `run_records` of training runs: `labkit.claims.records`), and
`claim_checks` turns each comparison into a `labkit.checks` line; `speed_checks`
(`labkit.claims.speed`) prints what step times may say on any machine. Nothing in a
verdict is typed by hand: on another machine the same code may well find that a claim holds where
it did not hold here.

>>> claims_table().rows[0][0]
'speed'
"""

from labkit.claims.catalog import CLAIMS, METRICS, Claim, claims_table, get
from labkit.claims.records import run_records
from labkit.claims.speed import speed_checks
from labkit.claims.tables import claim_checks, speed_table, summary_table, verdict_table
from labkit.claims.verdicts import Verdict, verdict

__all__ = ["CLAIMS", "METRICS", "Claim", "Verdict", "claim_checks", "claims_table", "get", "run_records", "speed_checks",
           "speed_table", "summary_table", "verdict", "verdict_table"]
