"""TensorBoard event files for every reported metric, without TensorFlow, torch or `tensorboard`.

- `events`: the tfevents format (TFRecord framing, the Event/Summary protobufs) and Determined's
  rule for which report becomes which tag; pure.
- `writer`: event files in a log directory.
- `sync`: the upload to checkpoint storage, in Determined's layout.
- `manager`: what the Core API runs in TensorboardMode AUTO.
- `determined_compat`: the writer Determined's own `determined.core` gets when neither TensorFlow
  nor torch's TensorBoard is installed (the agent's det_shim installs it).

Importing this package imports only the standard library (the shim relies on it).
"""
