"""What a run is and how it is measured: the contract and its vocabulary, the measurement protocol, the command line, its outputs and provenance, where settings show."""
