"""TensorRT flavours trtflow builds with: TensorRT-RTX and full TensorRT, behind one Backend interface."""
