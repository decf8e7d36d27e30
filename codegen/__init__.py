"""Code generation: Jinja CUDA templates and the code that fills them."""
