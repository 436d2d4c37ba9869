# daemon/: the tqkvd process.
