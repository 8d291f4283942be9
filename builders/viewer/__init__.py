"""The viewer (`counterfactory show`): a static, browsable HTML gallery of a build, and the plots of its card.

source.py      a build folder or a Hub dataset at a revision -> one split (load_dataset)
row_view.py    RowView: how a table's rows are viewed, declared by its builder (dataset
               packages' view.py), carried by the build manifest; generic fallback
rows.py        a row as a page record (texts, facets, provenance) following its view
thumbnails.py  one small JPEG per image, decorrelation masks outlined
stats.py       counts per facet value and skip reason, numeric columns
plots.py       bar charts, histograms, example grids (PNG)
render.py      pages, search index, index.html, stats.html
card_figures.py  the example grid + histograms a dataset card embeds
(the `show` subcommand itself is `builders.app.show_cli`)
"""
