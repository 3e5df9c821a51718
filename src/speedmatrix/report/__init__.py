"""The report: tables built once as data (``table``), rendered as markdown and as HTML.

Layers, each importing only the ones above it:

- ``fmt``: numbers, contexts, statuses as text (imports nothing of speedmatrix);
- ``table``: the blocks of a document (headings, paragraphs, lists, tables, images) and
  their two renderers, markdown and HTML;
- ``sections``: the report's tables that are not a workload's own (servers, sweeps, gates, GPU, ...);
- ``document``: the whole report of a run, and the report rule.

A workload's own table (prefill, sustained decode, ...) lives with the workload
(``speedmatrix.workloads``). This file imports nothing, so that a workload can
use ``fmt`` and ``table`` while ``document`` uses the workloads.
"""
