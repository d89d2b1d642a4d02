"""Everything the project keeps on disk goes through here: atomic files, the npz+JSON record,
and the per-client state store (memory and disk behind one object)."""
