"""Bridges to other libraries; each imports its library only when it is imported itself (``import onlinesoftmax``
never imports them)."""
