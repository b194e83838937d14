"""Diagnostic: the DFlash server with every cycle plain (lookups searched then dropped, drafter never run)."""
import sys
sys.path.insert(0, "scripts")
import serve_cycles
from blockdraft.decoding.engine import SpeculativeEngine
orig = SpeculativeEngine._lookups
SpeculativeEngine._lookups = lambda self, seqs, rows: [None for _ in orig(self, seqs, rows)]
SpeculativeEngine._draft_length = lambda self, seq, rows: 0
sys.exit(serve_cycles.main(sys.argv[1:]))
