"""The one exception of the audit package: input the caller can fix."""

__all__ = ["AuditInputError"]


class AuditInputError(ValueError):
    """Observed or expected sample ids that cannot be audited as given.

    The message names the file, the problem and what to change. The tool layer turns it into a
    ToolError for the agent.
    """
