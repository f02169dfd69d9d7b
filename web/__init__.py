"""The pages (HTML, CSS, JS), shipped inside the package as gpuq.web: see pyproject.toml."""
