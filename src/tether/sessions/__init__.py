"""Session commands and reads: the layer between HTTP and the log for everything that is not a
run. It folds projections on demand (cached by `last_seq`) and appends the events that
create, rename, pin, archive, truncate and delete sessions."""
