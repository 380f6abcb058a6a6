"""What a run reads: documents converted to text by an isolated parser, and images kept as files."""
