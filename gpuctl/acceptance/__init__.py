"""Acceptance tests of a provisioned cluster: pytest + testinfra over the rendered inventory.

The ``test_*.py`` modules here check the installed state that `gpuctl provision` leaves (pinned
and held packages, services, files, devices), host by host through testinfra's Ansible backend,
with every expected value read from the rendered ``group_vars``. Run them with
``gpuctl acceptance CLUSTER`` (:mod:`gpuctl.acceptance.runner`) or with plain pytest::

    pytest -p gpuctl.acceptance.plugin --pyargs gpuctl.acceptance \\
        --hosts=ansible://all --ansible-inventory=RENDERED/inventory.yml

See docs/acceptance.md. The repository's own test run does not collect this package
(pyproject: ``testpaths = ["tests"]``).
"""
