"""The composition root: one broker stack (its log, broker, retention, object store uploader)
assembled the same way for a single node and for each group a cluster node holds
(:mod:`~messaging.stack.assemble`). The HTTP app of a stack is made above, by
:mod:`messaging.http`.
"""
