"""Object storage behind one interface: file:// (the embedded default) and s3://."""
