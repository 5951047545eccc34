"""python manage.py evaluate_predictor CSV --features EXPR [EXPR ...] --target EXPR
--interval 60s --horizon 15m [--seed S] [--max-train N] [--json]

Fits persistence, the linear regression and the LSTM on one load series and scores them on its
held-out test part (see `predictor.evaluation`). TensorFlow is loaded only once the input has
been checked, so a bad argument fails fast.
"""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from predictor.evaluation import MODEL_NAMES
from predictor.series import FEATURES, SeriesError, evaluate, horizon_steps, pad_features, parse_duration, read_csv


class Command(BaseCommand):
    help = "Evaluate the load forecasters (persistence, linear, LSTM) on a CSV series, split in time order."

    def add_arguments(self, parser):
        parser.add_argument("csv", help="CSV file with a header row; one row per interval, oldest first")
        parser.add_argument(
            "--features",
            nargs="+",
            required=True,
            metavar="EXPR",
            help="1 to 3 column names or arithmetic expressions over columns (fewer than 3 are repeated)",
        )
        parser.add_argument(
            "--target",
            required=True,
            metavar="EXPR",
            help="the load to forecast, as a fraction (0..1+), e.g. cpu_util_percent/100",
        )
        parser.add_argument("--interval", required=True, help="time between rows, e.g. 60s, 5m")
        parser.add_argument("--horizon", default="15m", help="how far ahead to forecast (default 15m)")
        parser.add_argument("--seed", type=int, default=0, help="random seed of the LSTM (default 0)")
        parser.add_argument(
            "--max-train",
            type=int,
            default=None,
            metavar="N",
            help="keep only the N most recent training windows (a cost bound; validation and test are never cut)",
        )
        parser.add_argument("--max-epochs", type=int, default=None, help="bound the LSTM's epochs (default 20)")
        parser.add_argument("--json", action="store_true", help="print one JSON object keyed by model name")

    def handle(self, *args, **options):
        from predictor.evaluation import evaluate as run_evaluation

        if options["max_train"] is not None and options["max_train"] < 1:
            raise CommandError("--max-train must be a positive number of windows")
        if options["max_epochs"] is not None and options["max_epochs"] < 1:
            raise CommandError("--max-epochs must be at least 1")
        if len(options["features"]) > FEATURES:
            raise CommandError(
                f"give 1 to {FEATURES} features, not {len(options['features'])}: the model takes {FEATURES}"
            )
        try:
            interval_s = parse_duration(options["interval"], "--interval")
            horizon_s = parse_duration(options["horizon"], "--horizon")
            steps = horizon_steps(interval_s, horizon_s)
            table = read_csv(options["csv"])
            features = pad_features([evaluate(table, text) for text in options["features"]])
            target = evaluate(table, options["target"])
            lstm_options = {"max_epochs": options["max_epochs"]} if options["max_epochs"] else None
            report = run_evaluation(
                features, target, steps, seed=options["seed"], max_train=options["max_train"], lstm_options=lstm_options
            )
        except SeriesError as exc:
            raise CommandError(str(exc)) from None
        report["input"] = {
            "csv": options["csv"],
            "features": options["features"],
            "target": options["target"],
            "interval_s": interval_s,
            "horizon_s": horizon_s,
            "seed": options["seed"],
        }
        if options["json"]:
            self.stdout.write(json.dumps(report, indent=2, sort_keys=True))
            return
        self._print_table(report)

    def _print_table(self, report: dict) -> None:
        split = report["split"]
        self.stdout.write(
            f"{report['input']['csv']}: {split['rows']} rows, target {split['steps']} samples ahead; "
            f"windows train {split['train']} / validation {split['validation']} / test {split['test']} "
            f"(gaps of {split['gap']})"
        )
        self.stdout.write(f"{'model':<12} {'MAE':>8} {'RMSE':>8} {'buckets':>8} {'vs persistence':>15} {'val MAE':>8}")
        for name in (*MODEL_NAMES, "champion"):
            row = report[name]
            label = f"champion ({row['model']})" if name == "champion" else name
            self.stdout.write(
                f"{label:<12} {row['mae']:8.4f} {row['rmse']:8.4f} {row['bucket_accuracy']:8.1%} "
                f"{row['improvement_pct']:+14.1f}% {row['validation']['mae']:8.4f}"
            )
        lstm = report["lstm"]
        self.stdout.write(
            f"LSTM: {lstm['epochs']} epochs in {lstm['fit_seconds']:.1f} s; one forecast "
            f"{lstm['latency_ms']['median']:.2f} ms (p95 {lstm['latency_ms']['p95']:.2f} ms)"
        )
