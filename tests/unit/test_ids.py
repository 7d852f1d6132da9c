"""The id shapes (shared/ids.py): what Meta and Chatwoot document passes, nothing else, and the
tenants of the two providers can never be mistaken for each other."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.chatwoot import account_of, tenant_id
from shared.ids import is_chatwoot_id, is_person_id, is_phone_number_id, is_user_id

NOT_IDS = ['ab"one', "ab\\", "a{b}", "../../me", "1/2", "", " 1", "1\n", "١٢٣", "²", "1" * 31]


@pytest.mark.parametrize(
    "user_id", ["US.13491208655302741918", "AR.7", "US.ENT.11815799212886844830", "BR.aB3"]
)
def test_documented_business_scoped_user_ids_pass(user_id: str) -> None:
    assert is_user_id(user_id) and is_person_id(user_id)


@pytest.mark.parametrize(
    "user_id", ["us.1", "USA.1", "US.", "US.1.2", "US.ENT.", "US." + "1" * 129, "US.1/..", 'US."']
)
def test_other_user_ids_do_not(user_id: str) -> None:
    assert not is_user_id(user_id)


@pytest.mark.parametrize("value", NOT_IDS)
def test_no_check_takes_what_could_leave_a_key_or_a_url(value: str) -> None:
    assert not is_phone_number_id(value)
    assert not is_person_id(value)
    assert not is_chatwoot_id(value)


@given(st.integers(0, 2**53), st.integers(0, 2**53))
def test_a_chatwoot_tenant_is_never_a_whatsapp_tenant(account: int, inbox: int) -> None:
    tenant = tenant_id(account, inbox)
    assert not is_phone_number_id(tenant)
    assert account_of(tenant) == str(account)


@given(st.text(min_size=1, max_size=40))
def test_a_whatsapp_tenant_is_never_a_chatwoot_tenant(value: str) -> None:
    if is_phone_number_id(value):
        with pytest.raises(ValueError):
            account_of(value)


def test_chatwoot_tenants_take_ascii_digits_only() -> None:
    """`\\d` would take any script's digits, and the account goes into Chatwoot's API URL."""
    with pytest.raises(ValueError):
        account_of("cw-١-3")
