"""Topic schemas, whatever the format: the versioned schema cache (store), the merge of inferred
schemas (merge), the type rules (rules) and the topic's schema hints (hints)."""
