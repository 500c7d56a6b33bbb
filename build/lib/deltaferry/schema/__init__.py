"""Topic schemas: the versioned schema cache (store) and the merge of inferred schemas (merge)."""
