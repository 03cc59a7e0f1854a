"""The compiler's bottom layer: what the frontend, the passes and the code
generators all build and read IR with. It imports only the generated
bindings (`tessera_mlir`), never a pass, an emitter or the frontend
(`test/test_layers.py`).

    context        an MLIR context with Tessera's dialects loaded
    graph_builder  Graph IR (tgraph) builders: the tracer's and tessera-autodiff's
    tile_builder   Tile IR (ttile) builders: tessera-lower-to-tile's and its kernels'
    types          element, buffer and tile types; enum attributes
    sharding       Sharding and Mesh: the #tgraph.sharding / tgraph.mesh model
    locations      the Python lines and names the frontend records in locations
    analysis       facts about index arithmetic (multiple_of)
    options        TargetOptions: every knob that changes generated code
    support        PassError, run_reporting and walks every pass needs
"""
