"""What keeps secrets out and trust in: the trust root outside the workspace, the secret scanner, redaction, quoting of the user's text and content digests."""
