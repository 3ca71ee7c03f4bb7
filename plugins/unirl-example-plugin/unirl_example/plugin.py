"""Registration: light imports only; the implementations load when a recipe uses them."""

from unirl import hookimpl
from unirl_example.config import DigitMatchConfig, ReverseDigitsConfig


@hookimpl
def unirl_register_tasks(register):
    register("reverse_digits", "unirl_example.task:ReverseDigitsTask", config_class=ReverseDigitsConfig,
             description="reverse a string of digits: '123>' -> '321'")


@hookimpl
def unirl_register_rewards(register):
    register("digit_match", "unirl_example.reward:DigitMatchReward", config_class=DigitMatchConfig,
             description="fraction of positions matching the reference answer, in [0, 1]")
