"""The audit's phase modules under their former names (requant/_aliases.py): `requant.audit.decode`
and `requant.audit.injection` are the phase modules themselves, and `requant.audit.report_phases`
is the phases package, whose names are the phase modules' own functions. Reference: the modules
imported under their new names."""

import importlib

import requant.audit.phases as phases
import requant.audit.phases.decode as decode
import requant.audit.phases.injection as injection


def test_old_module_paths_are_the_phase_modules():
    assert importlib.import_module("requant.audit.decode") is decode
    assert importlib.import_module("requant.audit.injection") is injection
    assert importlib.import_module("requant.audit.report_phases") is phases


def test_old_names_are_the_phase_functions():
    from requant.audit.decode import DEFAULT_BATCHES, batch_prompts
    from requant.audit.injection import FaultInjector, run_injection, score_injection
    from requant.audit.report_phases import decode_markdown, injection_markdown, plot_injection

    assert (decode_markdown, batch_prompts, DEFAULT_BATCHES) == (
        decode.decode_markdown,
        decode.batch_prompts,
        decode.DEFAULT_BATCHES,
    )
    assert (injection_markdown, plot_injection, run_injection, score_injection, FaultInjector) == (
        injection.injection_markdown,
        injection.plot_injection,
        injection.run_injection,
        injection.score_injection,
        injection.FaultInjector,
    )


def test_a_monkeypatch_through_the_old_name_is_seen_by_the_new(monkeypatch):
    old = importlib.import_module("requant.audit.injection")
    monkeypatch.setattr(old, "DEFAULT_TOKENS", {"cpu": 1, "cuda": 1})
    assert injection.DEFAULT_TOKENS == {"cpu": 1, "cuda": 1}
