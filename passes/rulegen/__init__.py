"""TASO-style rule generation: enumerate small graphs, fingerprint them, verify what agrees.

The package (used by `tgc-rulegen`, tgc/tools/rulegen.py):

- `terms.py`: the ops the enumeration may use (`OpSpec`), terms (graphs of those ops over a
  few inputs, hash-consed), and their evaluation with the ops' numpy `reference`s;
- `enumerate.py`: every term of up to k ops, built bottom-up from class representatives, and
  the candidate rules that equal fingerprints give;
- `verify.py`: a candidate's most general shapes (by unification), then random testing in
  float64 on several shape instantiations and many input draws;
- `prune.py`: rules that follow from others by renaming inputs or by substituting a subgraph
  for an input (TASO's pruning), dropped;
- `table.py`: the survivors written as a `.tg` rule table (passes/rule_file.py reads it);
- `known.py`: the hand-written rules, to report which were rediscovered.
"""
