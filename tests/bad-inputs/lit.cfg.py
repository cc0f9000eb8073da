# lit configuration of tests/bad-inputs: the tool tests' configuration (tests/lit), rooted here.
import os

lit_config.load_config(config, os.path.join(config.forge_src_root, "tests", "lit", "lit.cfg.py"))
config.name = "Forge bad inputs"
config.test_source_root = os.path.join(config.forge_src_root, "tests", "bad-inputs")
config.test_exec_root = os.path.join(config.forge_obj_root, "tests", "bad-inputs")
config.excludes = ["CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py.in", "README.md"]
