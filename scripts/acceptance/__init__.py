"""The parts of scripts/gpu_acceptance.py: correctness, throughput, feeding (data and end to end).

Each part runs in its own process (`child.py part NAME`), writes what it found to a JSON file
after every entry (`record.Recorder`) and is killed when its time box ends; the parent
(scripts/gpu_acceptance.py) merges the parts' files into one report (`report.py`).
"""
