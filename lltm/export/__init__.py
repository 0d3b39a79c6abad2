"""Deployment of lltm models beyond torch.export.

- lltm.export.onnx: ONNX export (the lltm operators as ONNX ops, a Scan over
  time), through torch.onnx's dynamo exporter; needs onnx and onnxscript.
- lltm.export.torchscript: the hook that makes torch.jit.script refuse
  lltm's modules with an error that says what to use instead.

Nothing here is imported by ``import lltm``.
"""
