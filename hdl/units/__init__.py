"""The chip's execution units, one module each (hardware spec 4): `base` (what they share: the port block,
operand latching, the start/busy/done skeleton), `ld` (the LD unit, the book's DMA), `st`, `mm`, `rq`,
`sm`, `vadd`, `amax`, `unpack`. Every unit reaches the scratchpad through one `hdl.scratchpad.SpadPort`
member, ``spad``.
"""
