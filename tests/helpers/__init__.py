"""What the tests share, by what it holds (tests import these modules as `from helpers.x import y`, from
any folder of tests/: pyproject.toml sets pythonpath = ["tests"]; no test imports another test module):

- configs: tiny configs on the built-in shapes data (`TINY` overrides, `tiny_config`, `composed`).
- runs: the real commands in a subprocess (vit-train, the other entry points, vit-sweep-summary,
  torchrun) and another process holding a run directory's lock.
- two_processes: the torchrun tests' overrides (`TINY`) and the oracle of 2 processes against 1
  (`assert_weights_close`).
- files: what a run wrote (metrics.jsonl rows, results.json, TensorBoard scalars, checkpoint weights,
  every file's bytes) and the comparison of a resumed run (or sweep) with an uninterrupted one: the
  oracle of every file a user reads.
- sweep_runs: a sweep run in this process as `vit-train -m` runs it (job records, run_job, summary).
- images: image folders, loose images and a CIFAR-10 in its python layout, written for a test.
- ugly_folder: an image folder as users have them (hidden entries, every image mode, odd names).
- shards, shard_streams: small WebDataset shards whose pixels name the sample; the stream a loader
  reads from them, read back as sample ids, and a run's config on them.
- special_files, places: FIFOs, sockets, devices and link loops where a file is expected; a command on
  a real full or read-only tmpfs.
- toy_options: a data set and an objective written outside vit_train, as a user writes their own.
- killer, fs_killer, diskfull, group_signal, stream_keys: scripts run in a child process (a real
  SIGKILL at a chosen moment, or before the n-th file-system call; a run that fills a small tmpfs; a
  stop signal to the process group; the sample ids each torchrun rank reads) by train/test_faults.py,
  outputs/test_save_order.py, train/test_group_signals.py, data/test_webdataset_runs.py and
  tests/faults/fault_table.py.
"""
