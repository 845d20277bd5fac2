"""One module per dataset family; `pflkit.data.datasets` is the registry over them."""
