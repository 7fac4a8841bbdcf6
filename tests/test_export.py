"""CSV export: run.to_csv(), compare(...).to_csv(), and the report's download links.

Runs are real run folders written by tests/fakes.py and read back with load_run; the CSV is parsed
back with pandas and compared with the tables it came from.
"""

from __future__ import annotations

import base64
import io
import re

import pandas as pd
import pytest
from fakes import write_run

from hpclab.records.export import flat
from hpclab.records.store import load_run
from hpclab.views.charts.comparison import compare
from hpclab.views.charts.report import render_report


def test_list_columns_become_one_column_per_rank():
    frame = pd.DataFrame({"step": [1, 2], "rank_samples_per_sec": [[10.0, 12.0], [11.0, None]]})
    out = flat(frame)
    assert list(out.columns) == ["step", "rank_samples_per_sec_0", "rank_samples_per_sec_1"]
    assert out["rank_samples_per_sec_1"].tolist()[0] == 12.0 and pd.isna(out.iloc[1, 2])


def test_a_recorded_runs_history_and_epochs_round_trip(tmp_path):
    run = load_run(write_run(tmp_path, val_accs=[0.5, 0.7, 0.9], history=12))
    back = pd.read_csv(io.StringIO(run.to_csv()))
    assert len(back) == len(run.history) == 12
    assert back["step"].tolist() == run.history["step"].tolist()
    assert back["loss"].tolist() == pytest.approx(run.history["loss"].tolist())
    assert "rank_samples_per_sec_1" in back.columns  # two ranks, one column each
    epochs = pd.read_csv(io.StringIO(run.to_csv(table="epochs")))
    assert epochs["val_accuracy"].tolist() == pytest.approx([0.5, 0.7, 0.9])
    path = run.to_csv(tmp_path / "h.csv")
    assert path.read_text() == run.to_csv()
    with pytest.raises(ValueError, match="table must be one of history, epochs"):
        run.to_csv(table="summary")


def test_comparison_table_to_csv(tmp_path):
    runs = [load_run(write_run(tmp_path, batch_per_worker=b, val_accs=[a]))
            for b, a in ((32, 0.8), (64, 0.9))]  # fmt: skip
    back = pd.read_csv(io.StringIO(compare(runs).to_csv()))
    assert len(back) == 2 and back["val_accuracy"].tolist() == pytest.approx([0.8, 0.9])


def test_report_links_each_runs_csv_and_charts_download_as_svg(tmp_path):
    run = load_run(write_run(tmp_path, val_accs=[0.6, 0.8]))
    page = render_report([run])
    links = dict(re.findall(r'download="([^"]+)" href="data:text/csv;charset=utf-8;base64,([^"]+)"',
                            page))  # fmt: skip
    assert set(links) == {f"{run.run_id}-history.csv", f"{run.run_id}-epochs.csv"}
    assert base64.b64decode(links[f"{run.run_id}-epochs.csv"]).decode() == run.to_csv(
        table="epochs"
    )
    assert '"toImageButtonOptions": {"format": "svg"' in page
