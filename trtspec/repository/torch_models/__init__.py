"""The Python-backend `model.py` files of the torch-runtime repository.

Each module here is copied verbatim into `<model>/1/model.py` by the emitter; they import only
Triton's `triton_python_backend_utils`, numpy and trtspec (installed in the serving Python)."""
