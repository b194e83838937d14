"""`blockdraft qualify`: measure a target + drafter pair and judge it (a front end over `blockdraft.bench`)."""
