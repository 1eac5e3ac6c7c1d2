"""The serving engine: host-side batching and page bookkeeping, device-side KV pages."""
