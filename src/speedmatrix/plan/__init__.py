"""An experiment: its file checked against the schema, its defaults applied, its references between keys
checked, and expanded into server configs and cells (``experiment``)."""
