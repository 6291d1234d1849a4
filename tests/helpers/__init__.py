"""What the tests share, by what it holds (tests import these modules; no test imports another test):

- configs: tiny configs on the built-in shapes data (`TINY` overrides, `tiny_config`, `composed`).
- runs: the real commands in a subprocess (vit-train, the other entry points, vit-sweep-summary,
  torchrun) and another process holding a run directory's lock.
- files: what a run wrote (metrics.jsonl rows, results.json, TensorBoard scalars, checkpoint weights,
  every file's bytes) and the comparison of a resumed run (or sweep) with an uninterrupted one: the
  oracle of every file a user reads.
- sweep_runs: a sweep run in this process as `vit-train -m` runs it (job records, run_job, summary).
- images: image folders, loose images and a CIFAR-10 in its python layout, written for a test.
- ugly_folder: an image folder as users have them (hidden entries, every image mode, odd names).
- killer, fs_killer, diskfull: scripts run in a child process (a real SIGKILL at a chosen moment, or
  before the n-th file-system call; a run that fills a small tmpfs) by test_faults.py,
  test_save_order.py and scripts/fault_table.py.
"""
