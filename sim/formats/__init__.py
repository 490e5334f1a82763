"""File formats: the book's program-record file (`hexfile`: read, write, and make a record)."""
