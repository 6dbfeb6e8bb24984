.PHONY: test run golden bench lint

test:            ## the whole suite (installs what it needs)
	bash scripts/test.sh

run:             ## run the agent on this host
	bash scripts/run.sh

golden:          ## regenerate golden files (metrics output, docs) after an intended change
	bash scripts/venv.sh test
	python3 scripts/sync_chart.py
	UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/test_golden.py tests/metrics/test_catalog.py tests/deploy/test_alerts.py tests/kubernetes/test_podresources.py tests/throughput/test_throughput_sampler.py

bench:           ## performance figures on the DGX fixture, side by side with node_exporter (installs wrk)
	bash scripts/bench.sh

lint:
	bash scripts/venv.sh test
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy
