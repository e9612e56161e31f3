"""Unit tests of measured.py's reading of ncu's CSV and its step arithmetic
(no GPU: ncu's raw page as it lays it out, written by hand)."""
import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import measured  # noqa: E402

CSV = '''"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","gpu__time_duration.sum"
"","","","","","","","","","","","usecond"
"0","11","ddptrain","h","layer_norm_forward_f16","1","7","(128, 1, 1)","(512, 1, 1)","0","9.0","17.50"
"1","11","ddptrain","h","sm90_xmma_gemm_f16f16_f16f32","1","7","(384, 1, 1)","(96, 1, 1)","0","9.0","1,204.00"
"2","11","ddptrain","h","layer_norm_forward_f16","1","7","(128, 1, 1)","(512, 1, 1)","0","9.0","16.50"
'''


class ReadNcu(unittest.TestCase):
    def test_rows_sum_per_name_in_the_units_row(self):
        got = measured.read_ncu_csv(CSV)
        self.assertEqual(got["layer_norm_forward_f16"], (2, 34.0))
        self.assertEqual(got["sm90_xmma_gemm_f16f16_f16f32"], (1, 1204.0))

    def test_nanoseconds(self):
        got = measured.read_ncu_csv(CSV.replace('"usecond"', '"nsecond"'))
        self.assertAlmostEqual(got["layer_norm_forward_f16"][1], 0.034)

    def test_no_duration_column_is_an_error_naming_it(self):
        with self.assertRaises(SystemExit) as e:
            measured.read_ncu_csv(CSV.replace("gpu__time_duration.sum", "sm__cycles"))
        self.assertIn("gpu__time_duration.sum", str(e.exception))


class Step(unittest.TestCase):
    def test_the_longer_runs_surplus_is_the_step(self):
        short = {"a": (4, 40.0), "b": (2, 10.0)}
        long = {"a": (6, 61.0), "b": (2, 10.0), "c": (1, 5.0)}
        self.assertEqual(measured.one_step(short, long), {"a": (2, 21.0), "c": (1, 5.0)})

    def test_our_kernels_by_name_the_rest_as_cublas(self):
        modeled = {"kernels": [
            {"name": "a", "kind": "kernel", "launches": 2, "modeled_us": 20.0},
            {"name": "gone", "kind": "kernel", "launches": 1, "modeled_us": 3.0},
            {"name": "cublas gemm f16 NN", "kind": "gemm", "launches": 3, "modeled_us": 30.0},
            {"name": "cuMemsetD8Async", "kind": "memset", "launches": 1, "modeled_us": 2.0},
        ]}
        rows = measured.compare({"a": (2, 21.0), "sm90_gemm": (3, 33.0)}, modeled)
        self.assertEqual(rows[0], ("a", 2, 21.0, 2, 20.0))
        self.assertIn(("gone", 0, 0.0, 1, 3.0), rows)
        self.assertEqual(rows[-1], (measured.CUBLAS, 3, 33.0, 3, 30.0))
        self.assertNotIn("cuMemsetD8Async", [r[0] for r in rows])


if __name__ == "__main__":
    unittest.main()
