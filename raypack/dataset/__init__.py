"""What comes out, on disk: a dataset's layout and versions, its manifest, the set-aside of
--overwrite, the lease of a rebuild, the token store."""
