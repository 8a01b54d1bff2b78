//! A consumer group's static members (KIP-345), seen and removed from outside the group: what
//! Kafka's `AdminClient.removeMembersFromConsumerGroup` does. A static member that goes away
//! without leaving keeps its share until the session timeout, so that a restarted pod gets it
//! back; one that is gone for good (its pod removed by a scale-in) is removed by its instance
//! id, and the group rebalances at once.

use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::{ApiKey, DescribeGroupsRequest, GroupId, LeaveGroupRequest};
use kafka_protocol::protocol::StrBytes;

use crate::Connection;

/// Kafka's `UNKNOWN_MEMBER_ID`: a member to remove that is not (or no longer) in the group.
pub const UNKNOWN_MEMBER_ID: i16 = 25;
/// Kafka's `GROUP_ID_NOT_FOUND`: Kafka 4's group coordinator answers a DescribeGroups of a
/// group it does not know with it (older ones answered the state `Dead`, no error).
pub const GROUP_ID_NOT_FOUND: i16 = 69;

/// The instance ids of `group`'s static members, asked of its coordinator (`connection`).
/// A group that does not exist, or is empty, has none.
pub fn static_members(connection: &mut Connection, group: &str) -> Result<Vec<String>, String> {
    if !connection.speaks(ApiKey::DescribeGroups) {
        return Err(format!(
            "{} does not speak DescribeGroups version 4 or later (Kafka 2.4)",
            connection.address()
        ));
    }
    let response = connection
        .send(
            &DescribeGroupsRequest::default()
                .with_groups(vec![GroupId(StrBytes::from_string(group.to_string()))]),
        )
        .map_err(|e| e.to_string())?;
    let described = response
        .groups
        .into_iter()
        .next()
        .ok_or("DescribeGroups answered nothing")?;
    if described.error_code == GROUP_ID_NOT_FOUND {
        return Ok(Vec::new());
    }
    if described.error_code != 0 {
        return Err(format!(
            "describing consumer group {group}: error code {}",
            described.error_code
        ));
    }
    Ok(described
        .members
        .into_iter()
        .filter_map(|m| m.group_instance_id.map(|id| id.to_string()))
        .collect())
}

/// Removes the static members `instance_ids` from `group` through its coordinator
/// (`connection`): each id with the error code the coordinator answered for it (0: removed;
/// [`UNKNOWN_MEMBER_ID`]: it was not a member).
pub fn remove_static_members(
    connection: &mut Connection,
    group: &str,
    instance_ids: &[String],
) -> Result<Vec<(String, i16)>, String> {
    let members = instance_ids
        .iter()
        .map(|id| {
            MemberIdentity::default()
                // Unknown to us: the coordinator finds the member by its instance id.
                .with_member_id(StrBytes::from_static_str(""))
                .with_group_instance_id(Some(StrBytes::from_string(id.clone())))
        })
        .collect();
    let response = connection
        .send(
            &LeaveGroupRequest::default()
                .with_group_id(GroupId(StrBytes::from_string(group.to_string())))
                .with_members(members),
        )
        .map_err(|e| e.to_string())?;
    if response.error_code != 0 {
        return Err(format!(
            "removing members of consumer group {group}: error code {}",
            response.error_code
        ));
    }
    Ok(response
        .members
        .into_iter()
        .map(|m| {
            (
                m.group_instance_id
                    .map(|i| i.to_string())
                    .unwrap_or_default(),
                m.error_code,
            )
        })
        .collect())
}
