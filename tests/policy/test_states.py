from clockq.policy.states import TERMINAL_STATES, JobState, can_transition, sources_for

S = JobState


def test_succeeded_is_final():
    assert not any(can_transition(S.SUCCEEDED, dst) for dst in S)


def test_only_queued_jobs_can_start_running():
    assert sources_for(S.RUNNING) == {S.QUEUED}


def test_every_terminal_state_but_success_can_be_requeued():
    assert {s for s in TERMINAL_STATES if can_transition(s, S.QUEUED)} == {S.FAILED, S.CANCELLED, S.TIMED_OUT}
