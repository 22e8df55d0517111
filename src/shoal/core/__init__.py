"""Pure logic: types, paging arithmetic, placement and state machines. No I/O here."""
