"""Actions as text (ppx.schedules.ir.action)."""

from ppx.schedules import Action, Op


def test_action_strings_round_trip():
    for text in ["0F1", "1B3", "2I0", "2W0", "0SEND_F1", "1RECV_B0", "12F345"]:
        assert str(Action.parse(text)) == text
    assert Action.parse("3RECV_F2") == Action(3, Op.RECV_F, 2)
