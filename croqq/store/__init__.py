"""The results repo: paths, schemas, the serialized writer, validation and cleaning."""
