"""The server lifecycle: launch argv and runtime pins (``runtimes``), process groups, ports and ownership
(``procs``), the broker process that owns one vLLM server (``broker``), a node's GPUs as a pool (``pool``),
where a server runs and who measured beside whom (``placement``), the cells' side of a server: find, start,
hold (``server``), and whether a multi-GPU config's GPUs reach each other (``p2p``)."""
