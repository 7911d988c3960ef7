"""What runs inside a trial process: the Core API (`harness.core`) and checkpoint storage
(`harness.storage`). Depends on nothing from the master; torch is never imported here."""
